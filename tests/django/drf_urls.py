"""URLs of the Django REST framework tests (``@pytest.mark.urls`` in test_drf.py)."""

from __future__ import annotations

from django.urls import path

from tests.django import drf_views as views

order = views.OrderViewSet.as_view({"get": "retrieve", "put": "update"})

urlpatterns = [
    path("api-view/<int:order_id>/", views.pay),
    path("api-view-outside/<int:order_id>/", views.pay_outside),
    path("apiview/<int:order_id>/", views.PayView.as_view()),
    path("decorated/<int:order_id>/", views.DecoratedPayView.as_view()),
    path("viewset/<str:pk>/", order),
]
