"""Names and places that the container's parts share, and the words the host passes to the main process.

The host has the same values (terminus_env/sandbox/channel.py and sandbox.py); a test holds the two to each other.
"""

LOG_PREFIX = "terminus-env: "  # on the main process's lines in the container's log
RUN_DIR = "/run/terminus"  # the host side's own tmpfs: the report of the container's split
SPLIT_REPORT = RUN_DIR + "/split"
CHANNEL_SOCKET = RUN_DIR + "/channel"  # where the daemon takes the relay's streams over (the host has the same)
CHANNEL_DIR = "/run/terminus-channel"  # a host folder a local engine mounts, where the host listens (DIRECT)
DIRECT, RELAY = "direct", "relay"  # how the host reaches the daemon (main's CHANNEL argument; the host has both)
HOSTS, CUT_OFF, AS_IS = "hosts", "cut-off", "as-is"  # what main does about the network first (sandbox.py has them)
TESTS_FOLDER = "/tests"  # the verifier's tests: read-only on its side, filled by the daemon
PRIVATE_MOUNTS = ((RUN_DIR, "size=1m,mode=0700"), (TESTS_FOLDER, "size=512m,mode=0755"),
                  ("/logs/verifier", "size=256m,mode=0777"))  # fmt: skip
# What the agent's side has in their place: writable decoys of its own, small (they hold memory).
DECOY_MOUNTS = ((RUN_DIR, "size=1m,mode=0700"), (TESTS_FOLDER, "size=16m,mode=0755"),
                ("/logs/verifier", "size=16m,mode=0777"))  # fmt: skip
SHARED_MEMORY = "/dev/shm"  # each side has its own: the verifier's is a fresh tmpfs of the same size
PTY_LIMIT = 256  # terminals one container may hold (kernel.pty.max is the host's, shared by every container)
