"""URLs of the decorator tests and of the admin page's browser test."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from tests.django import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("pay/<int:order_id>/", views.pay),
    path("quick/<int:order_id>/", views.quick),
    path("quick-423/<int:order_id>/", views.quick_423),
    path("quick-raise/<int:order_id>/", views.quick_raise),
    path("quick-callable/<int:order_id>/", views.quick_callable),
    path("async/<int:order_id>/", views.async_pay),
    path("cbv/<int:order_id>/", views.PayView.as_view()),
    path("dispatch/<int:order_id>/", views.DispatchView.as_view()),
]

urlpatterns += [
    path("accounts/<str:db>/<int:account_id>/withdraw/", views.withdraw),
    path("accounts/<str:db>/<int:account_id>/withdraw-async/", views.withdraw_async),
]

from tests.django import leak_views  # noqa: E402 -- appended per test module

urlpatterns += [
    path("leaky/<str:name>/", leak_views.leaky),
    path("leaky-async/<str:name>/", leak_views.leaky_async),
    path("leaky-executor/<str:name>/", leak_views.leaky_executor),
    path("throttled/<str:name>/", leak_views.throttled),
]
