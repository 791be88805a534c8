"""When the verifier's tests began: the line between the runner starting up, where code the agent provided decides
the verdict instead of being judged by it, and the tests, which exercise that code."""

import os

from .code_files import RUNNER_CONFIGS
from .opened_files import is_conftest, is_runner_file, is_test_file


class StartOfTests:
    """Told each file the verifier opened, the first time, in order; says which of them came before the tests.

    The tests begin at the first test file (a Python file of the verifier's own tests, or a project's ``test_*.py``
    or ``*_test.py``). The project's own test code begins earlier, at the first ``conftest.py`` the image ships
    unchanged: pytest loads it before any test file, and what it imports is the package the tests exercise. A file
    one of the agent's links leads to never begins either: a start-up read made a link to a test file would."""

    def __init__(self, links, expects_tests):
        self.expects_tests = expects_tests  # the tests hold Python files, or a script names a test runner
        self.link_targets = frozenset(link["target"] for link in links)
        self.link_folders = tuple(link["target"].rstrip("/") + "/" for link in links if link.get("folder"))
        self.tests_at = None  # the order of the first test file opened
        self.project_at = None  # the order of the first of the image's own conftest.py files opened
        self.runner_seen = False  # a file of a Python test runner's own package was opened
        self.last = 0

    def via_link(self, path):
        return path in self.link_targets or path.startswith(self.link_folders)

    def see(self, order, path, in_tests, written_by_verifier, image_unchanged):
        """The file ``path`` was first opened as the ``order``-th event: ``in_tests``, on the verifier's own test
        mount; ``written_by_verifier``, made by the verifier in this run (an installer unpacking a package's tests);
        ``image_unchanged``, the image's own, changed by no one in this container."""
        self.last = order
        if not self.runner_seen and is_runner_file(path):
            self.runner_seen = True
        if self.via_link(path):
            return
        if self.tests_at is None and (is_test_file(path, in_tests=True) if in_tests
                                      else not written_by_verifier and is_test_file(path)):  # fmt: skip
            self.tests_at = order
        if self.project_at is None and not in_tests and image_unchanged and is_conftest(path):
            self.project_at = order

    def boundary(self):
        """The order where the tests began: every file first opened before it was opened by the runner starting up.
        Where no test file was opened, a runner that started or tests that hold Python files or name a test runner
        make everything the runner's start (fail closed); scripts that name no test runner, with none started, are
        the test themselves, and only the rules that hold at any time apply (0)."""
        if self.tests_at is not None:
            return self.tests_at
        if self.runner_seen or self.expects_tests:
            return self.last + 1
        return 0

    def early(self, path, first):
        """Whether the file ``path``, first opened as the ``first``-th event, was opened by the runner starting up. A
        runner's configuration (a conftest.py, an ini file) is that until the first test file, whoever loads it."""
        boundary = self.boundary()
        if is_conftest(path) or os.path.basename(path) in RUNNER_CONFIGS or self.project_at is None:
            return first < boundary
        return first < min(boundary, self.project_at)
