"""Where a turn's prompt is computed: on the decoder D alone, or on a prefiller P and then pulled by D.

disagg.py         the decision: the gates every policy shares, then the policy in force (--pd-policy)
cost_model.py     policy ours: each option's TTFT and stall in milliseconds, a pure function
online_rates.py   the cost model's rates, learned from the proxy's own requests
peer_policies.py  the field's deciders (Dynamo's, llm-d's) as policies, pure functions
decider.py        the decision for one turn of the PD flow: reads the request's hits and the workers' loads,
                  counts hybrid misroutes, and feeds the rates what the turn showed
"""
