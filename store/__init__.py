"""The database: typed SQLAlchemy 2.0 models, sessions, and the queries api and worker share."""
