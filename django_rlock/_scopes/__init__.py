"""The units of work whose end ends the holds taken in them: the Django face's scopes.

A database transaction (:mod:`.transactions`: a ``with`` block inside an
atomic block gives its lock back when the transaction ends), a request
(:mod:`.requests`: the holds a view kept are reported and given back) and a
Celery task run (:mod:`.taskruns`). They import the engine and nothing of
the face above its ground floor.
"""
