#!/usr/bin/env python3
"""Container health probe: exit 0 when GET <url> answers 200, else 1.

The images run it as their HEALTHCHECK (slim images ship no curl):
    base-healthcheck                  -> http://127.0.0.1:$BASE_PORT/health (port 8000 by default)
    base-healthcheck URL              -> that URL (the router image probes /readiness)
Standard library only: it runs in every image stage before anything else is installed.
"""

import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 5.0


def default_url() -> str:
    return f"http://127.0.0.1:{os.environ.get('BASE_PORT', '8000')}/health"


def probe(url: str, timeout: float = TIMEOUT_S) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status = resp.status
    except urllib.error.HTTPError as err:  # 4xx/5xx arrive as exceptions
        status = err.code
    except (urllib.error.URLError, OSError) as err:
        print(f"unhealthy: {url}: {err}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"unhealthy: {url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: base-healthcheck [URL]", file=sys.stderr)
        return 2
    return probe(argv[0] if argv else default_url())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
