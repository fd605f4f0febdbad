"""What watches the holds an alias's locks report: the Django face's observers.

Hold times and the ``Retry-After`` they give (:mod:`.holdtimes`,
:mod:`.retryafter`), signals and the slow-lock log (:mod:`.reporting`),
Prometheus metrics (:mod:`.metrics`; both watch one backend's hold events,
:mod:`.holdevents`), the eviction-policy probe
(:mod:`.eviction`) and the wait graph ``manage.py rlock waits`` reads
(:mod:`.waitgraph`). They tell an alias's lock by
:class:`~django_rlock.backends._types.AliasAttached` and never import the
alias-lock modules or the backends that build them.
"""
