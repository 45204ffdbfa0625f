"""Built-in drivers; importing this package registers them.

``mock`` is pure numpy. ``lerobot`` imports LeRobot only when a component connects,
so registering it costs nothing and a missing SDK surfaces as a DriverUnavailableError.
"""

from rlinf_nb.robots.drivers import lerobot, mock  # noqa: F401
