"""Run under HTTPolice's own virtualenv (`make test-http`): the exchanges HTTPolice reads from each pair of raw TCP
streams (request stream, response stream), checked, as JSON on stdout: one list of exchanges per pair, in the order
given. tests/conformance/test_httpolice.py drives it.

    python httpolice_check.py REQ1 RESP1 [REQ2 RESP2 ...]
"""

import json
import sys

import httpolice
from httpolice.inputs.streams import streams_input


def notices(item):
    return [{"id": c.id, "severity": c.severity.name} for c in item.complaints] if item is not None else []


def main():
    out = []
    paths = sys.argv[1:]
    for i in range(0, len(paths), 2):
        out.append([check(exch) for exch in streams_input(paths[i:i + 2])])
    json.dump(out, sys.stdout)


def check(exch):
    httpolice.check_exchange(exch)
    req = exch.request
    return {
        "request": f"{req.method} {req.target}" if req is not None else None,
        "request_notices": notices(req),
        "exchange_notices": notices(exch),
        "responses": [{"status": int(resp.status), "notices": notices(resp)} for resp in exch.responses],
    }


if __name__ == "__main__":
    main()
