"""Judge rewards: rewards that rules cannot write, scored by an LLM judge as each episode
ends (``types``: the data; ``rubric``: prompts, answer schemas, parsing and scoring, pure;
``endpoint``: an OpenAI-compatible judge). See docs/rewards.md."""
