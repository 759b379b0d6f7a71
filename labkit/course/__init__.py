"""The course itself: where the labs are, the device configurations, student notebooks and releases,
and the site that renders them.
"""
