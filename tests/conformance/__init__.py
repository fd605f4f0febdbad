"""One conformance suite: every lock rule written once, run against every engine.

Like Django's cache tests (one base class, every backend), each rule here talks
to a driver (``drivers.py``) and runs for every engine it applies to
(``conftest.ENGINES``): the sync engine, the asyncio engine, and the Django
backends (Redis, embedded, LocMem) through ``django_rlock.locks``, each also
through Django's async path (``async with rlock(...)``). A behaviour that
differs between engines fails here.

What is not generated, and why (never a skip):

* An engine without a server the test reaches would get no rule that deletes
  a key under a holder, kills a connection or needs Redis 6.2
  (``engines(server=True)``); one whose ``async with`` yields an adapter
  would get the ``with`` rules only (``engines(full_api=False)``). Every
  engine has both today: LocMem is the engine on a private embedded server,
  and the embedded and LocMem backends have the native asyncio lock.
* Cancellation needs asyncio owners (``engines(is_async=True)``); signals
  are the Django face's (``engines(django=True)``).
* ACL users are set on the test's own server, not on the embedded or LocMem
  backend's.

Known drifts are strict xfails naming the drift, so a fix flips them to
failures that say "remove the mark".
"""
