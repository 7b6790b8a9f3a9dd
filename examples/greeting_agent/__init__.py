"""A greeting agent: an a2a-sdk AgentExecutor (`agent.GreetingAgentExecutor`), the shape of the
hello-world sample that ships with a2a-sdk.

Host it with `manage.py create_agent greeter --name Greeter --description … --executor
python:examples.greeting_agent.agent:GreetingAgentExecutor`, the project root on the workers'
PYTHONPATH.
"""
