"""URLs of the shop: a small JSON API over orders."""

from django.urls import path

from orders import views

urlpatterns = [
    path("orders/<int:order_id>/", views.order_detail, name="order-detail"),
    path("orders/<int:order_id>/pay/", views.pay, name="order-pay"),
    path("orders/<int:order_id>/refund/", views.refund, name="order-refund"),
    path("customers/<int:customer_id>/report/", views.start_report, name="customer-report"),
]
