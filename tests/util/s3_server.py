"""A real S3 HTTP server on 127.0.0.1 for the tests: moto's server mode (PyPI `moto[server]`) with
signature checking on (INITIAL_NO_AUTH_ACTION_COUNT: only the setup's IAM calls go unsigned; every
request after them is verified against the IAM user's secret key, as AWS does), behind a small
fault-injecting proxy the tests steer:
  - proxy.fail_for(seconds): every request answered `503 SlowDown` meanwhile;
  - proxy.drop_next(n): the next n object GETs are cut half-way (connection closed mid-body);
  - proxy.stop() / proxy.start(): the endpoint goes away (connections refused) and comes back,
    as a restarted server; moto keeps its objects in memory, so the proxy is what restarts;
  - proxy.redirect = True: every request answered `301 PermanentRedirect` (a bucket in another
    region), which a client must not take for success.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

PY = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_head(sock, buf):
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None, buf
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


def _content_length(head):
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _with_connection_close(head):
    lines = [l for l in head.split(b"\r\n") if not l.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"Connection: close"])


class FaultProxy:
    """HTTP/1.1 proxy to moto, one upstream connection per request."""

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.port = free_port()
        self.fail_until = 0.0
        self.drops_left = 0
        self.redirect = False
        self.requests = 0
        self.injected = {"503": 0, "dropped": 0}
        self.lock = threading.Lock()
        self.listener = None
        self.start()

    def start(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def stop(self):
        s, self.listener = self.listener, None
        s.shutdown(socket.SHUT_RDWR)
        s.close()

    def fail_for(self, seconds):
        self.fail_until = time.time() + seconds

    def drop_next(self, n):
        with self.lock:
            self.drops_left = n

    def _accept(self, listener):
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        try:
            while self.listener is not None:
                head, buf = _read_head(conn, buf)
                if head is None:
                    return
                n = _content_length(head)
                while len(buf) < n:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:n], buf[n:]
                self.requests += 1
                if self.redirect:
                    msg = (b"<Error><Code>PermanentRedirect</Code><Message>The bucket you are attempting to access "
                           b"must be addressed using the specified endpoint.</Message></Error>")
                    conn.sendall(b"HTTP/1.1 301 Moved Permanently\r\nx-amz-bucket-region: eu-west-1\r\n"
                                 b"Content-Type: application/xml\r\nContent-Length: " + str(len(msg)).encode() +
                                 b"\r\n\r\n" + msg)
                    continue
                if time.time() < self.fail_until:
                    self.injected["503"] += 1
                    msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                                 b"Content-Length: " + str(len(msg)).encode() + b"\r\n\r\n" + msg)
                    continue
                up = socket.create_connection(("127.0.0.1", self.upstream))
                up.sendall(_with_connection_close(head) + b"\r\n\r\n" + body)
                resp = b""
                while True:
                    chunk = up.recv(1 << 20)
                    if not chunk:
                        break
                    resp += chunk
                up.close()
                rhead, _, rbody = resp.partition(b"\r\n\r\n")
                drop = False
                if head.startswith(b"GET ") and b"?" not in head.split(b" ")[1] and len(rbody) > 64:
                    with self.lock:
                        if self.drops_left > 0:
                            self.drops_left -= 1
                            drop = True
                if drop:
                    self.injected["dropped"] += 1
                    conn.sendall(_with_connection_close(rhead) + b"\r\n\r\n" + rbody[: len(rbody) // 2])
                    return
                conn.sendall(_with_connection_close(rhead) + b"\r\n\r\n" + rbody)
                return
        except OSError:
            return
        finally:
            conn.close()


class S3Server:
    """moto + FaultProxy; `env` holds what a client needs (endpoint, region, the IAM user's keys)."""

    def __init__(self, bucket="moe-test"):
        self.moto_port = free_port()
        self.log = open(os.environ.get("MOE_TEST_MOTO_LOG", os.devnull), "w")  # for debugging
        self.proc = subprocess.Popen(
            [PY, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.moto_port)],
            stdout=self.log, stderr=self.log,
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4", "S3_UPLOAD_PART_MIN_SIZE": "65536"})
        import boto3  # installed with moto
        kw = dict(endpoint_url=f"http://127.0.0.1:{self.moto_port}", region_name="us-east-1",
                  aws_access_key_id="setup", aws_secret_access_key="setup")
        t0 = time.time()
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.moto_port), timeout=1).close()
                break
            except OSError:
                assert time.time() - t0 < 60, "moto server did not start"
                time.sleep(0.2)
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="trainer")
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        self.bucket = bucket
        self.proxy = FaultProxy(self.moto_port)
        self.env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.proxy.port}", "AWS_REGION": "us-east-1",
                    "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
                    "AWS_MAX_ATTEMPTS": "12"}
        self.s3 = boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                               aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
        self.s3.create_bucket(Bucket=bucket)

    def keys(self, prefix=""):
        out, token = [], None
        while True:
            kw = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            r = self.s3.list_objects_v2(**kw)
            out += [o["Key"] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return out
            token = r["NextContinuationToken"]

    def get(self, key):
        return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def put(self, key, data):
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
