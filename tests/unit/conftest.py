import sys
from pathlib import Path

# the doubles live next to the tests
sys.path.insert(0, str(Path(__file__).parent))
