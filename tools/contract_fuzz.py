"""Run Schemathesis against a running Sluice with a fresh account's API token.

Usage: python3 tools/contract_fuzz.py BASE_URL [SCHEMATHESIS_ARGS...]

Signs up a user through the server's own sign-up, makes an API token the way the account page
does, gives the account credits enough for every generated upload (with SLUICE_SERVER_BIN and
DATABASE_URL, as an operator would: `server grant-credits`), then runs
`schemathesis run BASE_URL/api/v1/openapi.json --checks all` with tools/schemathesis.toml.
Exits with Schemathesis's status: any failure fails the run.
"""

import http.cookiejar
import json
import os
import random
import subprocess
import sys
import urllib.parse
import urllib.request


def post_form(opener, base, path, fields):
    request = urllib.request.Request(
        base + path,
        data=urllib.parse.urlencode(fields).encode(),
        headers={"Origin": base, "Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
    )
    with opener.open(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def main():
    base = sys.argv[1].rstrip("/")
    extra = sys.argv[2:]
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    email = f"fuzz-{random.getrandbits(48):x}@example.com"
    post_form(opener, base, "/api/sign_up", {"email": email, "password": "fuzzing password 123"})
    token = post_form(opener, base, "/api/create_token", {"name": "schemathesis"})["secret"]
    server = os.environ.get("SLUICE_SERVER_BIN")
    if server:
        subprocess.run([server, "grant-credits", "--email", email, "--amount", "1000000"], check=True,
                       env={**os.environ, "SLUICE_LOG": "warn"}, stdout=subprocess.DEVNULL)
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemathesis.toml")
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", config, "run",
        f"{base}/api/v1/openapi.json", "-H", f"Authorization: Bearer {token}", "--checks", "all", *extra,
    ]
    print("contract fuzz:", " ".join(c if not c.startswith("Authorization") else "Authorization: Bearer ***" for c in command), flush=True)
    sys.exit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
