import subprocess

STATS = "/app/stats"


def make(*targets):
    return subprocess.run(["make", "-C", STATS, *targets], capture_output=True, text=True)


def test_clean_build_succeeds():
    assert make("clean").returncode == 0
    build = make()
    assert build.returncode == 0, build.stdout + build.stderr


def test_statistics_are_right():
    make()
    run = subprocess.run([f"{STATS}/bin/stats"], input="2 4 4 4 5 5 7 9", capture_output=True, text=True)
    assert run.stdout.strip() == "count=8 mean=5.000 stddev=2.000"
    run = subprocess.run([f"{STATS}/bin/stats"], input="1.5\n2.5\n", capture_output=True, text=True)
    assert run.stdout.strip() == "count=2 mean=2.000 stddev=0.500"


def test_empty_input_is_an_error():
    make()
    run = subprocess.run([f"{STATS}/bin/stats"], input="", capture_output=True, text=True)
    assert run.returncode == 1
