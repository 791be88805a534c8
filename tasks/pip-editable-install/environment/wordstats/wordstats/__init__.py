"""Count the words of a text."""

import sys

GREETING = "wordstats"


def count_words(text):
    return len(text.split())


def main():
    print(count_words(sys.stdin.read()))
