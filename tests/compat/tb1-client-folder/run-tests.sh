#!/bin/bash
# Terminal-Bench 1 runs the tests with pytest from $TEST_DIR; offline, the image's pytest.
python3 -m pytest -p no:cacheprovider -rA "$TEST_DIR/test_outputs.py"
