__version__ = "0.1.0"

#: Schema of the artifacts (``klrelease.artifact``; a learner writes the same schema).
SCHEMA_VERSION = "2.0"
