#!/usr/bin/env python3
"""Re-measure the abuse table (issues 23 and 34) against a running Sluice, black-box (standard library only).

    python3 tools/abuse_table.py http://127.0.0.1:3000 /path/to/data-folder

Each row is what an abuser (a stranger, or a free account) does, and what it cost the operator.
"""
import json
import os
import socket
import sys
import time
import urllib.parse
import uuid

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:3000"
DATA = sys.argv[2] if len(sys.argv) > 2 else ".data"
HOST, PORT = urllib.parse.urlparse(BASE).hostname, urllib.parse.urlparse(BASE).port or 80


def folder_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def request(method, path, body=b"", headers=None, read_answer=True, source=None):
    """One HTTP/1.1 request on its own connection (from `source`, an address of this host, if
    given): (status, headers, body)."""
    sock = socket.create_connection((HOST, PORT), timeout=30, source_address=(source, 0) if source else None)
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{PORT}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    sock.sendall(head.encode() + b"\r\n" + body)
    data = b""
    while read_answer:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs.setdefault(k.strip().lower(), []).append(v.strip())
    if "chunked" in ",".join(hdrs.get("transfer-encoding", [])):
        out, rest2 = b"", rest
        while rest2:
            size_line, _, rest2 = rest2.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out, rest2 = out + rest2[:size], rest2[size + 2:]
        rest = out
    return status, hdrs, rest


def sign_up():
    email = f"abuser-{uuid.uuid4().hex[:8]}@example.com"
    form = urllib.parse.urlencode({"email": email, "password": "a long password"}).encode()
    status, hdrs, _ = request("POST", "/api/sign_up", form, {
        "Content-Type": "application/x-www-form-urlencoded", "Origin": BASE})
    assert status == 200, status
    cookie = next(c.split(";")[0] for c in hdrs["set-cookie"] if c.startswith("sluice_session="))
    return {"Cookie": cookie, "Origin": BASE}


def balance(session):
    _, _, body = request("POST", "/api/me", b"", session)
    return json.loads(body)["balance"]


def upload(session, name, data):
    boundary = "abuse-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"preset\"\r\n\r\nsummarize\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: text/plain\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    status, _, answer = request("POST", "/api/v1/jobs", body, dict(session, **{
        "Content-Type": f"multipart/form-data; boundary={boundary}"}))
    return status, json.loads(answer or b"{}")


def cancel_and_wait(session, job_id):
    """Cancel, then wait until the job has ended (a running one stops at its next safe point)."""
    status = request("POST", f"/api/v1/jobs/{job_id}/cancel", b"", session)[0]
    for _ in range(100):
        _, _, body = request("GET", f"/api/v1/jobs/{job_id}", b"", session)
        if json.loads(body)["state"] in ("canceled", "failed", "done"):
            break
        time.sleep(0.1)
    return status


def row_storage():
    session = sign_up()
    before = folder_bytes(DATA)
    # 3 MB: what the 20 sign-up credits buy now that a text is priced by its tokens.
    text = ("Three megabytes of honest words, line after line.\n" * 70_000).encode()[:3_000_000]
    status, job = upload(session, "big.txt", text)
    assert status == 202, (status, job)
    cancel_and_wait(session, job["id"])
    statuses = []
    last = job["id"]
    for _ in range(20):
        status, _, answer = request("POST", f"/api/v1/jobs/{last}/run-again", b"{}",
                                    dict(session, **{"Content-Type": "application/json"}))
        statuses.append(status)
        if status == 202:
            last = json.loads(answer)["id"]
            cancel_and_wait(session, last)
    grown = folder_bytes(DATA) - before
    time.sleep(35)  # the release runs every 30 s
    kept = folder_bytes(DATA) - before
    return (f"upload 3 MB (16 credits), cancel, then run again + cancel 20 times",
            f"run-again answers {sorted(set(statuses))}; the data folder grew {grown / 1e6:.1f} MB at most "
            f"(shared, not copied), {kept / 1e6:.1f} MB 35 s later; balance {balance(session)} of 20")


def row_unread_body():
    sock = socket.create_connection((HOST, PORT), timeout=30)
    sock.sendall(f"PUT /api/v1/webhook HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {1 << 30}\r\n\r\n".encode())
    sent, started, chunk = 0, time.time(), b"[" * 65536
    sock.settimeout(0.2)
    answer = b""
    while time.time() - started < 8:
        try:
            sock.sendall(chunk)
            sent += len(chunk)
        except OSError:
            break
        try:
            answer = sock.recv(4096)
            if answer:
                break
        except socket.timeout:
            pass
    status = answer.split(b" ")[1].decode() if answer else "none"
    return ("`PUT /api/v1/webhook` with a 1 GB JSON body and no token",
            f"{status} after {time.time() - started:.2f} s with {sent / 1e6:.1f} MB sent (the declared length alone refuses it)")


def row_server_fn_body():
    session = sign_up()
    status, _, body = request("POST", "/api/log_in", b"email=a%40b.c&password=" + b"x" * 200_000,
                              dict(session, **{"Content-Type": "application/x-www-form-urlencoded"}))
    return ("a server function (`/api/log_in`) given a body over its limit", f"{status} {body[:60].decode(errors='replace')}")


def row_server_fn_args():
    session = sign_up()
    status, _, body = request("POST", "/api/list_jobs", b"page=99999999999999999999",
                              dict(session, **{"Content-Type": "application/x-www-form-urlencoded"}))
    return ("a server function given a bad argument (`list_jobs` with `page=99999999999999999999`)",
            f"{status} {body[:80].decode(errors='replace')}")


def row_half_open():
    held = []
    for _ in range(1500):
        s = socket.create_connection((HOST, PORT), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: sluice\r\nX-Slow: ")
        held.append(s)
    served = 0
    started = time.time()
    while time.time() - started < 15:
        if request("GET", "/healthz")[0] == 200:
            served += 1
        time.sleep(0.5)
    still_open = 0
    for s in held:
        s.settimeout(0.05)
        try:
            # Closed is an end of file, after whatever answer came first (503 past a share).
            while s.recv(65536):
                pass
        except socket.timeout:
            still_open += 1
        except OSError:
            pass
        s.close()
    return ("1,500 connections that send half a request header",
            f"{still_open} still open after 15 s; {served} of {served} health checks answered 200 meanwhile")


def row_connections_per_address():
    """One address holds more connections than its share; /healthz is still answered to it."""
    held, refused = [], 0
    for _ in range(300):
        s = socket.create_connection((HOST, PORT), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: sluice\r\n")  # an unfinished head: the connection stays
        held.append(s)
    time.sleep(0.5)
    status, hdrs, _ = request("GET", "/api/v1/jobs")
    other = request("GET", "/api/v1/jobs/00000000-0000-0000-0000-000000000000", source="127.0.0.2")[0]
    health_other = request("GET", "/healthz", source="127.0.0.3")[0]
    time.sleep(2.5)  # its own unfinished heads in the health lane time out
    health_same = request("GET", "/healthz")[0]
    for s in held:
        s.close()
    return ("one address opens 300 connections (they would take another host's share, health checks included)",
            f"past its share of 256: its next request {status} with Retry-After {hdrs.get('retry-after', ['none'])[0]}; "
            f"another address served ({other}, asked to log in), its /healthz {health_other}; "
            f"the flooding address's own /healthz {health_same} once its unfinished heads in the lane timed out")


def row_admin_area():
    session = sign_up()
    status, _, body = request("POST", "/api/admin/dlq_replay", b"kind=nonsense&reason=x",
                              dict(session, **{"Content-Type": "application/x-www-form-urlencoded"}))
    return ("a user calls `admin/dlq_replay` with a bad argument", f"{status} {body[:40].decode(errors='replace')}")


def row_tokens():
    session = sign_up()
    statuses = []
    for n in range(22):
        status, _, _ = request("POST", "/api/create_token", f"name=t{n}".encode(),
                               dict(session, **{"Content-Type": "application/x-www-form-urlencoded"}))
        statuses.append(status)
    return ("one account creates 22 API tokens (each a callback, sharing one outbox turn)",
            f"{statuses.count(200)} created, then {sorted(set(s for s in statuses if s != 200))}")


def row_estimates():
    """Issue 55: estimates have their own rate and slots; they never hold an upload's."""
    session = sign_up()
    boundary = "abuse-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"preset\"\r\n\r\nsummarize\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n"
            f"Content-Type: text/plain\r\n\r\n").encode() + b"words " * 1000 + f"\r\n--{boundary}--\r\n".encode()
    headers = dict(session, **{"Content-Type": f"multipart/form-data; boundary={boundary}"})
    statuses = [request("POST", "/api/v1/estimate", body, headers)[0] for _ in range(70)]
    status, _ = upload(session, "after.txt", b"an upload right after the estimates\n")
    answered = [s for s in statuses if s != 429]
    return ("one account asks for 70 estimates in a row, then uploads",
            f"{len(answered)} answered ({sorted(set(answered))}; a new account has no credits until its address is "
            f"confirmed), then {statuses.count(429)} × 429 (60 a minute per account); the upload right after: {status} "
            f"(not held up by them)")


def row_mail_folder():
    """Issue 55: the mail folder holds live reset and verification links."""
    folder = os.path.join(DATA, "outbox")
    if not os.path.isdir(folder):
        return ("the mail folder's modes", "no mail folder (SMTP configured)")
    modes = sorted({oct(os.stat(os.path.join(folder, f)).st_mode & 0o777) for f in os.listdir(folder)})
    return ("another user on the host reads the mail folder (reset links)",
            f"folder {oct(os.stat(folder).st_mode & 0o777)}, files {modes or 'none yet'}")


if __name__ == "__main__":
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    print("| what | measured |\n|---|---|")
    rows = (row_storage, row_unread_body, row_server_fn_body, row_server_fn_args, row_half_open,
            row_connections_per_address, row_admin_area, row_tokens, row_estimates, row_mail_folder)
    only = [r for r in rows if r.__name__ in sys.argv[3:]] or rows
    for row in only:
        what, measured = row()
        print(f"| {what} | {measured} |", flush=True)
