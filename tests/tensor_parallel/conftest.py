import sys
from pathlib import Path

# The helpers module sits beside the tests; importlib mode does not add it to sys.path.
sys.path.insert(0, str(Path(__file__).parent))
