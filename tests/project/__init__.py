"""Tests of the project as a whole: the docs' commands run (test_docs.py), imports
(test_imports.py), the sdist (test_sdist.py), the CI workflows users copy
(test_cli_workflow.py, test_workflow_safety.py, test_user_workflow.py) and small things
users trip on (test_user_facing.py)."""
