import sys
from pathlib import Path

# Tests import the model and graph zoo as `zoo`.
sys.path.insert(0, str(Path(__file__).parent))
