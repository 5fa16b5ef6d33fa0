#!/usr/bin/env python3
"""A relay agent written from the relay contract (v1) alone, for the tests.

It answers each POST at once and does the turn's work on a thread of its
own, replying over the host's reach socket ($THUNDERBOLT_REACH_SOCK): a
delta, a tool card (its input, then its output), a delta, done. A message
with "slow" in it gets one delta, then waits for the stop POST and tries
one more delta (which the host must refuse: the turn is over).

For the test that drives it, it prints one JSON object per line on stdout
(`listening` with its port, each `message` and `stop` it was POSTed, the
host's answer to the `late` delta) and takes `POST /note` ({"chat",
"text"}): a note to that chat between turns, answered with the host's
answer.

    THUNDERBOLT_REACH_SOCK=~/.thunderbolt/reach.sock python3 relay-butler.py
"""
import json
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SOCK = os.environ.get("THUNDERBOLT_REACH_SOCK") or os.path.expanduser("~/.thunderbolt/reach.sock")
# How long a slow turn waits for its stop before it gives up waiting.
STOP_WAIT_S = 60
# The longest body taken (a message with a few photos inline).
MAX_BODY = 64 * 1024 * 1024

stops = {}
stops_lock = threading.Lock()
out_lock = threading.Lock()


def say(**event):
    with out_lock:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def reach(**req):
    """One request on the reach socket, and its answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(SOCK)
        s.sendall((json.dumps(req) + "\n").encode())
        return json.loads(s.makefile().readline())


def stop_of(turn):
    with stops_lock:
        return stops.setdefault(turn, threading.Event())


def work(m):
    t = m["turn_id"]
    if "slow" in m["text"]:
        reach(op="turn.delta", turn_id=t, text="Working on it… ")
        stop_of(t).wait(STOP_WAIT_S)
        say(event="late", turn_id=t, answer=reach(op="turn.delta", turn_id=t, text="too late"))
        return
    reach(op="turn.delta", turn_id=t, text="Looking through your notes… ")
    reach(op="turn.tool", turn_id=t, id="1", kind="search", title="notes", input={"pattern": m["text"]})
    reach(op="turn.tool", turn_id=t, id="1", output="3 matches")
    reach(op="turn.delta", turn_id=t, text=f"found 3 notes about {m['text']}.")
    reach(op="turn.done", turn_id=t)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ValueError("body too large")
        return json.loads(self.rfile.read(n) or b"{}")

    def answer(self, status, payload=b""):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self):
        try:
            m = self.body()
        except ValueError:
            return self.answer(400)
        if self.path == "/note":
            return self.answer(200, json.dumps(reach(op="note", chat=m["chat"], text=m["text"])).encode())
        # The contract: accept at once, work afterwards.
        self.answer(200)
        kind = m.get("type")
        if kind == "message":
            say(event="message", body={k: v for k, v in m.items() if k != "images"}, images=len(m.get("images", [])))
            threading.Thread(target=work, args=(m,), daemon=True).start()
        elif kind == "stop":
            say(event="stop", body=m)
            stop_of(m["turn_id"]).set()
        # Anything else: a later version's type, ignored.


server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("BUTLER_PORT", "0"))), Handler)
say(event="listening", port=server.server_address[1])
server.serve_forever()
