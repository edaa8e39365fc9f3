"""Drop-in routes of the peers (code-judge, SandboxFusion): wire mappings and their routers."""
