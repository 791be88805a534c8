#!/bin/bash
# No unzip in the image: Python's zipfile module opens the middle layer.
set -e
work=$(mktemp -d)
tar -xf /data/archive.tar -C "$work"
python3 -m zipfile -e "$work/backup/records-bundle.zip" "$work/bundle"
tar -xzf "$work/bundle/records/invoices.tar.gz" -C "$work"
cp "$work/invoices/2031/invoice-2031.pdf" /app/invoice-2031.pdf
rm -rf "$work"
