#!/usr/bin/env python3
"""A Peloton client in Python: gRPC over TLS with the server's CA and a bearer token.

    pip install grpcio grpcio-tools
    PELOTON_CA_FILE=peloton-data/tls/ca.pem PELOTON_TOKEN_FILE=peloton-data/admin-token \
        python3 examples/python/client.py 127.0.0.1:5391

Instead of a token, a client certificate issued for one (`peloton token cert NAME --out DIR`):
PELOTON_CERT_FILE=DIR/NAME.pem PELOTON_KEY_FILE=DIR/NAME.key, without PELOTON_TOKEN*.

It compiles the API's stubs from proto/ into a temporary directory (grpc_tools), connects with
the CA file (TLS only: a secure server refuses plaintext) and sends the token with every call,
then prints who it is, the pools it may see and, if it may, the newest audit entries.
"""

import os
import sys
import tempfile

import grpc
from grpc_tools import protoc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PROTO_DIR = os.path.join(ROOT, "proto", "proto")


def stubs():
    """Compiles peloton.proto into Python modules and imports them."""
    out = tempfile.mkdtemp(prefix="peloton-py-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    code = protoc.main([
        "protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}",
        f"--grpc_python_out={out}", "peloton/v1/peloton.proto",
        "google/api/annotations.proto", "google/api/http.proto",
    ])
    if code != 0:
        sys.exit("cannot compile the proto")
    sys.path.insert(0, out)
    from peloton.v1 import peloton_pb2, peloton_pb2_grpc  # noqa: E402
    return peloton_pb2, peloton_pb2_grpc


def token():
    """The bearer token from PELOTON_TOKEN or PELOTON_TOKEN_FILE, or None."""
    if os.environ.get("PELOTON_TOKEN"):
        return os.environ["PELOTON_TOKEN"].strip()
    if os.environ.get("PELOTON_TOKEN_FILE"):
        with open(os.environ["PELOTON_TOKEN_FILE"]) as f:
            return f.read().strip()
    return None


def read(path):
    with open(path, "rb") as f:
        return f.read()


def credentials():
    """TLS with our CA only (and a client certificate if one is given), and the token on
    every call if one is given."""
    ca = read(os.environ["PELOTON_CA_FILE"])
    cert, key = os.environ.get("PELOTON_CERT_FILE"), os.environ.get("PELOTON_KEY_FILE")
    if bool(cert) != bool(key):
        sys.exit("PELOTON_CERT_FILE and PELOTON_KEY_FILE: give both or neither")
    if cert and key:
        tls = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=read(key), certificate_chain=read(cert))
    else:
        tls = grpc.ssl_channel_credentials(root_certificates=ca)
    bearer = token()
    if bearer is None:
        return tls
    return grpc.composite_channel_credentials(tls, grpc.access_token_call_credentials(bearer))


def main():
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:5391"
    pb, rpc = stubs()
    with grpc.secure_channel(target, credentials()) as channel:
        access = rpc.AccessServiceStub(channel)
        me = access.WhoAmI(pb.WhoAmIRequest()).token
        grants = ", ".join(f"{pb.Role.Name(g.role)} on {g.pool}" for g in me.grants)
        print(f"whoami: {me.name} ({grants})")
        pools = rpc.ResourcePoolServiceStub(channel).List(pb.ListPoolsRequest())
        print("pools:", " ".join(p.path for p in pools.pools) or "(none)")
        try:
            audit = access.ListAudit(pb.ListAuditRequest(limit=5))
            for e in audit.entries:
                print(f"audit: {e.seq} {e.principal} {e.method} {e.target} code={e.code}")
        except grpc.RpcError as e:
            print(f"audit: {e.code().name}: {e.details()}")


if __name__ == "__main__":
    main()
