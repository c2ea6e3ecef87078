"""`python -m worker.agent --node NAME`: what `runyard agent` and the dev cluster start."""

from worker.agent.main import main

if __name__ == "__main__":
    main()
