"""URLs of the view-answer tests (``@pytest.mark.urls`` in test_view_answers.py)."""

from __future__ import annotations

from django.urls import path

from tests.django import answer_views as views

urlpatterns = [
    path("note/<str:note>/", views.note),
    path("note-or-raise/<str:note>/", views.note_or_raise),
    path("own/<str:note>/", views.own_note),
    path("failing/<str:note>/", views.failing_note),
    path("async/<str:note>/", views.async_note),
    path("with-rlock/<str:note>/", views.with_rlock),
    path("async-with-rlock/<str:note>/", views.async_with_rlock),
]
