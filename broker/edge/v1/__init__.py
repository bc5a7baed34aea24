"""The capstan.v1 servicers the broker serves: Admin, Pull and Consumer."""
