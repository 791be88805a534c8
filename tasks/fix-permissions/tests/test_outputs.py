import os
import pwd
import stat
from pathlib import Path


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_run_script_mode():
    assert mode("/srv/app/run.sh") == 0o750


def test_secret_key_mode():
    assert mode("/srv/app/secret.key") == 0o600


def test_public_owned_by_www_data():
    www = pwd.getpwnam("www-data")
    paths = [Path("/srv/app/public/index.html"), Path("/srv/app/public/css/site.css")]
    for path in paths:
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == (www.pw_uid, www.pw_gid), path


def test_contents_unchanged():
    assert Path("/srv/app/run.sh").read_text() == "#!/bin/sh\necho running\n"
    assert Path("/srv/app/secret.key").read_text() == "k3y-0f-th3-d4y\n"
    assert Path("/srv/app/public/index.html").read_text() == "<h1>hi</h1>\n"
