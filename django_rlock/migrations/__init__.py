"""The migrations of the unmanaged Lock model (the admin's page of live locks)."""
