"""capstan.v1.Admin: topics, groups, offsets and message lookup for people and operators."""
