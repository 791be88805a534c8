"""The links the agent made, in the folders where a name decides what runs: which it made before the verifier ran
(resolved when the run begins), and which of them, or of those made meanwhile, led to a file the verifier opened."""

import fnmatch
import glob
import os
import stat

from .code_files import PATH_DIRS

LINK_DIRS = PATH_DIRS + ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib/*-linux-gnu*",
                         "/usr/lib/*-linux-gnu*", "/usr/lib/python3*", "/usr/lib/python3*/*-packages",
                         "/usr/local/lib/python3*", "/usr/local/lib/python3*/*-packages", "/etc", "/etc/python3*",
                         "/root/.local/lib/python3*/site-packages")  # fmt: skip


def links_opened(since, window, opened, workdir, links, unrecorded=None):
    """Links changed in this container, whose targets the verifier opened, in the folders where a name decides
    what runs: programs, libraries, Python's, the root folder (pytest's configuration) and the working folder. Those
    made before the run are ``links`` (the layer's, resolved when the run began); a folder is listed again only if it
    changed while the verifier ran (a link made meanwhile). ``unrecorded``, where the watch left data unrecorded,
    gives a record for a target it has none of."""
    found, seen = [], set()
    candidates = [(link["path"], link["target"]) for link in links if not link.get("folder")]
    for folder in sorted(set(os.path.realpath(path) for pattern in LINK_DIRS + ("/", workdir)
                             for path in glob.glob(pattern))):  # fmt: skip
        try:
            if os.stat(folder).st_ctime < window:
                continue
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                link = os.lstat(path)
                if stat.S_ISLNK(link.st_mode) and link.st_ctime >= since:
                    candidates.append((path, os.path.realpath(path)))
            except OSError:
                continue
    for path, target in candidates:
        record = opened.get(target)
        if record is None and unrecorded is not None and os.path.isfile(target):
            record = unrecorded(target)
        if record is None or path in seen or not _in_link_folder(path, workdir):
            continue
        seen.add(path)
        found.append({"path": path, "target": target, "exec": record["exec"], "early": record["early"],
                      "magic": (record["head"] or b"")[:4].hex()})  # fmt: skip
    return found


def _in_link_folder(path, workdir):
    folder = os.path.dirname(path)
    return folder in ("/", workdir) or any(fnmatch.fnmatch(folder, pattern) for pattern in LINK_DIRS)


def agents_links(since, paths):
    """Of ``paths``, the links the agent made (changed in this container), with where each leads: the host looks
    for them among Docker's diff, the daemon knows which are links and where they lead now."""
    found = []
    for path in paths:
        try:
            link = os.lstat(path)
            if not stat.S_ISLNK(link.st_mode) or link.st_ctime < since:
                continue
            target = os.path.realpath(path)
            found.append({"path": path, "target": target, "folder": os.path.isdir(target)})
        except OSError:
            continue
    return found
