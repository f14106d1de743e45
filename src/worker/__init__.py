"""The edge (the Worker's logic), runtime-neutral: `edge.Edge.handle(EdgeRequest) -> Response`.

auth.py     bearer token check (sha256 digests, constant time)      routes.py   route table and path matching
query.py    query-string parsing with the protocol's rules          request.py  EdgeRequest, built by each runtime
prepare.py  one function per route: request -> the operation's typed arguments (durable/operations.py)
"""
