"""The switches that turn a missing engine, Ray or browser from a skip into a failure: CI sets them (``.ci/run``).
Test-only, so they live with the tests, not in the package's configuration."""

REQUIRE_DOCKER = "TERMINUS_REQUIRE_DOCKER"
REQUIRE_RAY = "TERMINUS_REQUIRE_RAY"
REQUIRE_BROWSER = "TERMINUS_REQUIRE_BROWSER"
