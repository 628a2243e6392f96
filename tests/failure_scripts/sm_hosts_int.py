"""DDP829: SM_HOSTS read as a number of hosts; it is a JSON list (run with SM_HOSTS='["algo-1","algo-2"]')."""
import os

num_hosts = int(os.environ["SM_HOSTS"])
