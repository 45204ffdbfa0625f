"""Built-in drivers; importing this package registers them.

``mock`` is pure numpy. ``lerobot`` (followers, ``lerobot_teleop``: leader arms, keyboard and
gamepad, ``lerobot_camera``: OpenCV cameras) imports LeRobot, and ``sim`` ManiSkill, only when a
component connects, so registering them costs nothing and a missing SDK or simulator
surfaces as a DriverUnavailableError.
"""

from rlinf_nb.robots.drivers import lerobot, lerobot_camera, lerobot_teleop, mock, sim  # noqa: F401
