"""Two tenants of equal weight, as a tenants file and their requests' headers."""

TENANTS = """
[[tenant]]
name = "amber"
key = "key-amber-0123456789"

[[tenant]]
name = "birch"
key = "key-birch-0123456789"
"""
AMBER = {"Authorization": "Bearer key-amber-0123456789"}
BIRCH = {"Authorization": "Bearer key-birch-0123456789"}
