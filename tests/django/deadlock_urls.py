"""URLs of the deadlock views (tests/django/deadlock_views.py)."""

from __future__ import annotations

from django.urls import path

from tests.django import deadlock_views as views

urlpatterns = [
    path("transfer/<str:run>/<str:first>/<str:second>/", views.transfer),
    path("transfer-locked/<str:run>/<str:first>/<str:second>/", views.transfer_locked),
]
