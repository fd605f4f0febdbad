"""Management commands of django-rlock."""
