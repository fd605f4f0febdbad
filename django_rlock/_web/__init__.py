"""What a Django project calls: the Django face's entry points.

``@locked`` (:mod:`.decorators`), ``rlock()`` and ``semaphore()``
(:mod:`.shortcuts`), ``leader()`` (:mod:`.leader`), ``@rate_limited``
(:mod:`.ratelimited`) and the busy and unavailable answers a view gives
(:mod:`.responses`). Each is exported by :mod:`django_rlock`; these modules
are not a user's API.
"""
