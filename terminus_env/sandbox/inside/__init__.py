"""The code that runs INSIDE a sandbox container (stdlib only, Python >= 3.6, Linux x86_64 or aarch64).

It plays two parts: the container's main process (started as ``main``) and the control daemon, which the main
process forks once the container is split.

``main``: the container's main process. Before anything of the task runs, it splits the container in three:
  - the agent's side: a PID and mount namespace whose init ("the agent's init") starts the image's ENTRYPOINT
    with the keep-alive command, then reaps orphans. Everything the agent ever runs lives there: the tmux
    terminal, its shell, whatever that shell starts, and the reference solution. It gets its own /proc, so it
    sees only its own processes, with Docker's masks of /proc copied over; the verifier's private folders and
    every folder above them are mount points here, so the agent can neither remove nor rename them;
  - the verifier's side: a PID namespace above the agent's (the verifier sees the agent's processes) with a
    mount namespace and a /proc of its own, where /tests, /logs/verifier and /run/terminus are fresh tmpfs
    mounts the agent's side never has;
  - the host's side (the container's first namespaces): this process and the control daemon, out of both
    other sides' sight.
  It keeps the container alive for the sandbox's lifetime, then exits, which ends the container.

The control daemon: a child of the main process on the host's side. The host connects to it once per container
  (take_channel): on a local engine through a socket in a folder of the host's mounted into the container, else
  through one long-lived ``docker exec``, a relay that hands its standard streams to the daemon over a socket only
  the host's side can reach. Either way the channel carries one JSON object per line each way, matched by ``id``.
  Every tmux operation, turn and verifier run is one round trip (well under a millisecond on a local engine)
  instead of a new ``docker exec`` (about 75 ms). Requests run on a fixed pool of threads, so a fork bomb that
  exhausts the pids limit cannot stop it answering. When its stdin closes, the owner process is gone (even after
  SIGKILL the kernel closes its socket), so it stops the container. While the verifier runs, it watches what the
  verifier opens (OpenWatch) and holds the root folder still (FrozenRoot).

Why the agent cannot forge a reply or a reward: the daemon is invisible from the agent's and the verifier's PID
namespaces (and not dumpable besides), so its pipes cannot be opened through /proc; the verifier's processes are
invisible from the agent's; the verifier's /tests and /logs/verifier are mounts the agent's side does not have,
and the daemon proves before and after each run that the verifier used those very mounts; and every process
started for the agent or the verifier runs with Docker's default capabilities and seccomp rules for a container
without CAP_SYS_ADMIN. Only the daemon keeps CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SETPCAP, CAP_NET_ADMIN and
CAP_LINUX_IMMUTABLE (to enter the sides' namespaces, drop capabilities for what it starts, watch the verifier
and hold the root folder still; the main process uses CAP_NET_ADMIN once, before anything of the task runs, to
cut a container with sidecars off the host); it never runs a program and imports nothing once the agent
exists, so no file the agent can write ever runs with them.

Its modules, by the side of the container each runs on:
  - the host's side: ``main`` (the container's main process) and ``network`` (what it does first), ``daemon`` (the
    control daemon), ``channel`` (the container's end of the control channel), and what the daemon does for the
    host: ``ops``, ``terminal``, ``tmux``, ``verify``, ``private_folders`` (the verifier's folders) and ``watch``
    (what the verifier ran);
  - the verifier's and the agent's sides: ``inits`` (PID 1 of each);
  - every side: ``names``, ``kernel``, ``seccomp``, ``processes``.

Shipping (terminus_env/sandbox/shipping.py): the host joins these modules into one source, in the order their
imports ask, without their imports of each other, and passes it to the main process in its environment. So they
import nothing but the standard library and each other (``from .module import name``, at the top of a module), and
no two of them define the same name.
"""
