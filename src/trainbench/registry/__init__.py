"""What exists, by name: the models (`models`), the frameworks with their strategies and facts
(`frameworks`), and the GPU types (`hardware`). Every other stage looks names up here.

May import: `trainbench.errors`, `trainbench.paths` (nothing of another stage).
"""
