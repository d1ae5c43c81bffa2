"""What the multi-node tests' job tasks run (tests/src/multi_node.rs): TCP and UDP servers,
probes, and an MPI-style all-to-all. Results are `key=value` lines in files of a shared folder.

  serve PORT UNTIL DIR            TCP+UDP on 0.0.0.0:PORT until the file UNTIL exists;
                                  DIR/serve-<host>.txt gets listening=, tcp_from=, udp_from=
  probe DIR PORT                  targets from $TARGETS_<host> ("name=host[@bind];..."):
                                  DIR/probe-<job>-<host>.txt gets name.tcp= and name.udp=
  alltoall PORT DIR               every task serves, waits for every peer's listener, then
                                  reaches each by host name and by the tenant address in
                                  $PEERS ("host=addr,..."): DIR/alltoall-<host>.txt
                                  ($BARRIER=addr: wait for the peers by address)
"""
import errno
import os
import socket
import sys
import threading
import time

HOST = socket.gethostname().split(".")[0]
ME = "%s@%s" % (os.environ.get("TENANCY_TENANT", "?"), HOST)


def err_name(e):
    if isinstance(e, socket.timeout):
        return "timeout"
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__


def append(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


def servers(port, log, stop):
    t = socket.socket()
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("0.0.0.0", port))
    t.listen(64)
    t.settimeout(0.2)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", port))
    u.settimeout(0.2)

    def tcp():
        while not stop():
            try:
                c, a = t.accept()
            except socket.timeout:
                continue
            append(log, "tcp_from=%s" % a[0])
            try:
                c.sendall(ME.encode())
                c.close()
            except OSError:
                pass

    def udp():
        while not stop():
            try:
                data, a = u.recvfrom(100)
            except socket.timeout:
                continue
            append(log, "udp_from=%s" % a[0])
            try:
                u.sendto(ME.encode(), a)
            except OSError:
                pass

    th = [threading.Thread(target=tcp, daemon=True), threading.Thread(target=udp, daemon=True)]
    for x in th:
        x.start()
    append(log, "listening=%d" % port)
    return th


def tcp_probe(host, port, bind=None, timeout=2.0):
    s = socket.socket()
    s.settimeout(timeout)
    try:
        if bind:
            s.bind((bind, 0))
        s.connect((host, port))
        return "ok " + s.recv(100).decode()
    except OSError as e:
        return err_name(e)
    finally:
        s.close()


def udp_probe(host, port, bind=None, tries=3):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.7)
    try:
        if bind:
            s.bind((bind, 0))
        for _ in range(tries):
            try:
                s.sendto(b"ping", (host, port))
                data, _ = s.recvfrom(100)
                return "ok " + data.decode()
            except socket.timeout:
                continue
        return "timeout"
    except OSError as e:
        return err_name(e)
    finally:
        s.close()


def main(argv):
    mode = argv[1]
    if mode == "serve":
        port, until, d = int(argv[2]), argv[3], argv[4]
        servers(port, os.path.join(d, "serve-%s.txt" % HOST), lambda: os.path.exists(until))
        while not os.path.exists(until):
            time.sleep(0.1)
    elif mode == "probe":
        d, port = argv[2], int(argv[3])
        out = os.path.join(d, "probe-%s-%s.txt" % (os.environ.get("SLURM_JOB_ID", "x"), HOST))
        for t in filter(None, os.environ.get("TARGETS_" + HOST, "").split(";")):
            name, rest = t.split("=", 1)
            host, _, bind = rest.partition("@")
            append(out, "%s.tcp=%s" % (name, tcp_probe(host, port, bind or None)))
            append(out, "%s.udp=%s" % (name, udp_probe(host, port, bind or None)))
        append(out, "done=1")
    elif mode == "alltoall":
        port, d = int(argv[2]), argv[3]
        n = int(os.environ["SLURM_NTASKS"])
        peers = dict(p.split("=", 1) for p in os.environ["PEERS"].split(","))
        done = lambda: len([f for f in os.listdir(d) if f.startswith("done.")]) >= n
        deadline = time.time() + 60
        servers(port, os.path.join(d, "serve-%s.txt" % HOST), lambda: done() or time.time() > deadline)
        out = os.path.join(d, "alltoall-%s.txt" % HOST)
        for host, addr in sorted(peers.items()):
            if host == HOST:
                continue
            # The peer's listener may start later: retry until it answers (a barrier).
            t0 = time.time()
            first = addr if os.environ.get("BARRIER") == "addr" else host
            while not tcp_probe(first, port).startswith("ok") and time.time() - t0 < 30:
                time.sleep(0.2)
            append(out, "%s.name.tcp=%s" % (host, tcp_probe(host, port)))
            append(out, "%s.name.udp=%s" % (host, udp_probe(host, port)))
            append(out, "%s.addr.tcp=%s" % (host, tcp_probe(addr, port)))
            append(out, "%s.addr.udp=%s" % (host, udp_probe(addr, port)))
        open(os.path.join(d, "done.%s" % HOST), "w").close()
        while not done() and time.time() < deadline:
            time.sleep(0.1)
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main(sys.argv)
