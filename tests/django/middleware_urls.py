"""URLs of the LockErrorMiddleware tests (``@pytest.mark.urls`` in test_middleware.py)."""

from __future__ import annotations

from django.urls import path

from tests.django import middleware_views as views

urlpatterns = [
    path("order/<int:order_id>/", views.order),
    path("async-order/<int:order_id>/", views.async_order),
    path("mem-order/<int:order_id>/", views.mem_order),
    path("page/<str:slug>/", views.page),
    path("async-page/<str:slug>/", views.async_page),
    path("locked-page/<str:slug>/", views.locked_page),
    path("partner/<int:tenant>/", views.partner),
    path("broken/", views.broken),
]
