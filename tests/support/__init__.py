"""What the test tiers share (and ``bench/`` re-uses); nothing here imports pytest.

- ``databases``: the shared servers' addresses, throwaway databases, one connection, a queue's Redis keys
- ``settings``: the fast role settings preset, in-process ``Settings``, the never-printed secret
- ``roles``: the one way to run judgequeue as processes (``RoleProcess``, ``Roles``, ``run_cli``) and their logs
- ``queries``: the reads of ``judgequeue.submissions`` tests repeat, and creating a queue
- ``waiting``: ``eventually`` (async) and ``wait_for`` (sync): waiting on a condition with a deadline
- ``pg_servers``, ``redis_servers``, ``pgbouncer``, ``tcp_proxy``: servers a test owns and may break
- ``chaos``, ``flow``: the chaos harness and jobs flowing through roles during a fault, with the end-state audit
- ``kmock_emulator``, ``operator``: the operator against an emulated API server; ``kube_schema``: the CRD's schema
- ``plugins``: a judge plugin installed as its own distribution; ``sandbox_host``: leftovers of sandboxed runs
"""
