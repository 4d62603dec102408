"""What the actors and serve decide with. Each subpackage holds one concern (engines, weights, learning,
judge, memory, tasks, promotion, evaluation); the modules at this level are shared by several."""
