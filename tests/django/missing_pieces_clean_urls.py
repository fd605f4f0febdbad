"""A URLconf whose views take no lock themselves (``@locked`` only): no W020."""

from __future__ import annotations

from tests.django.missing_pieces_urls import clean as urlpatterns

__all__ = ["urlpatterns"]
