"""The unmanaged Lock model (no table): it gives the admin its URLs and permission."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):
    """Create the unmanaged ``Lock`` model."""

    initial = True

    dependencies: ClassVar[list[tuple[str, str]]] = []

    operations: ClassVar[list[migrations.operations.base.Operation]] = [
        migrations.CreateModel(
            name="Lock",
            fields=[
                ("key", models.CharField(max_length=1024, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "lock",
                "verbose_name_plural": "locks",
                "default_permissions": ("view",),
                "managed": False,
            },
        ),
    ]
