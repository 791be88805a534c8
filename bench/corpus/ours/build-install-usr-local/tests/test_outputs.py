import subprocess


def test_greet_runs_from_path():
    result = subprocess.run(["greet", "Ada"], capture_output=True, text=True, check=True)
    assert result.stdout == "Hello, Ada!\n"


def test_a_program_links_against_the_installed_library(tmp_path):
    source = tmp_path / "use.c"
    source.write_text('#include <stdio.h>\n#include <greet.h>\nint main(void) { char b[64]; '
                      'greet_format(b, sizeof b, "linker"); puts(b); return 0; }\n')  # fmt: skip
    subprocess.run(["cc", "-o", str(tmp_path / "use"), str(source), "-lgreet"], check=True)
    result = subprocess.run([str(tmp_path / "use")], capture_output=True, text=True, check=True)
    assert result.stdout == "Hello, linker!\n"
