"""A currency-conversion agent: an a2a-sdk AgentExecutor (`agent.CurrencyAgentExecutor`).

Host it with `manage.py create_agent currency --name Currency --description … --executor
python:examples.currency_agent.agent:CurrencyAgentExecutor`, the project root on the workers'
PYTHONPATH.
"""
