"""The Scrapy peer of the benchmark; runs in bench/.venv-scrapy, not in the project venv."""
