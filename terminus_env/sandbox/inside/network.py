"""What the main process does about the network before anything of the task runs: cut a container on its episode's
network off the host, or write the /etc/hosts of a container without a network."""

import os
import socket
import struct
import sys

from .names import LOG_PREFIX

RTM_NEWROUTE, RTM_DELROUTE, NLMSG_ERROR = 24, 25, 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RT_SCOPE_NOWHERE, RTN_UNREACHABLE, RTA_DST = 254, 3, 0, 255, 7, 1
RTF_GATEWAY = 0x2


def default_gateway():
    """The IPv4 gateway of the default route, or None."""
    with open("/proc/net/route") as handle:
        for line in handle.readlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[1] == "00000000" and int(fields[3], 16) & RTF_GATEWAY:
                return socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
    return None


def route(op, destination, prefix, kind=0):
    """Add (RTM_NEWROUTE, of type ``kind``) or delete (RTM_DELROUTE) the IPv4 route to ``destination/prefix`` in
    the main table, through rtnetlink; raises OSError if the kernel refuses."""
    create = op == RTM_NEWROUTE
    flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL if create else 0)
    scope = RT_SCOPE_UNIVERSE if create else RT_SCOPE_NOWHERE  # NOWHERE: a deletion matches any scope
    body = struct.pack("BBBBBBBBI", socket.AF_INET, prefix, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT if create else 0,
                       scope, kind, 0)  # fmt: skip
    if prefix:
        body += struct.pack("HH", 8, RTA_DST) + socket.inet_aton(destination)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as netlink:  # 0: NETLINK_ROUTE
        netlink.sendall(struct.pack("IHHII", 16 + len(body), op, flags, 1, 0) + body)
        reply = netlink.recv(65536)
    kind_of_reply, error = struct.unpack("H", reply[4:6])[0], struct.unpack("i", reply[16:20])[0]
    if kind_of_reply == NLMSG_ERROR and error:
        raise OSError(-error, "{} {}/{}: {}".format("route add" if create else "route del", destination, prefix,
                                                    os.strerror(-error)))  # fmt: skip


def cut_off_host():
    """On an internal network the host still answers: at the gateway's address, and through the default route at
    every address it has. Drop the default route and make the gateway unreachable, so the container reaches
    exactly the other containers on its network (the agent's side has no CAP_NET_ADMIN to undo it)."""
    gateway = default_gateway()
    if gateway is None:
        return
    route(RTM_NEWROUTE, gateway, 32, RTN_UNREACHABLE)
    route(RTM_DELROUTE, "0.0.0.0", 0)


NO_NETWORK_HOSTS = (b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
                    b"ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")


def write_hosts():
    """A container started with its network disabled skips Docker's network set-up (about 200 ms of a start
    here) but gets an empty /etc/hosts, so `localhost` would not resolve: write what Docker writes for
    ``--network none``. The loopback device is up either way (runc brings it up)."""
    try:
        fd = os.open("/etc/hosts", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, NO_NETWORK_HOSTS)
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
    except OSError as exc:  # the image's own business (a read-only or linked /etc/hosts): say so, go on
        sys.stderr.write(LOG_PREFIX + "cannot write /etc/hosts: {}\n".format(exc))
