"""The applications built on the library: ``anchordiv demo`` and its data.

:mod:`~anchordiv.apps.demo` is the offline scene demo, :mod:`~anchordiv.apps.image_demo` the
emoji demo (``demo --images``), :mod:`~anchordiv.apps.serve_demo` the scene demo as a service
(``demo --serve``) and :mod:`~anchordiv.apps.emoji` the emoji pictures (``python -m
anchordiv.apps.emoji`` fetches them with npm). They import the library; the library never
imports them.
"""
