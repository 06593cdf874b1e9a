"""Short answers in everyday styles, written for specdecode (not taken from a benchmark).

Where an answer is short and repeats little of its prompt, a drafter has little to copy and a few failed
drafts already cost more than they save: the suite checks that the default drafter does not lose there
(run it at 64 new tokens and read the per-prompt worst ratio). Nine styles, six prompts each: answers in other
languages and scripts, SQL, JSON and summaries are where a draft model is most often wrong on first sight.
"""
from __future__ import annotations

from .bench_prompt import BenchPrompt

PROMPTS = {
    "chat": (
        "Hi! I just moved to a city where it rains most of the year. Any tips for staying cheerful?",
        "What is a good way to start learning to play the guitar as an adult with little free time?",
        "My sourdough bread comes out flat and dense. What might I be doing wrong?",
        "Can you explain in simple words why the sky looks blue during the day?",
        "I have a job interview tomorrow for a junior accountant position. How should I prepare tonight?",
        "Suggest a relaxing weekend plan for two people who like nature but hate crowds.",
    ),
    "math": (
        "A train leaves at 14:20 and arrives at 17:05. How long is the journey in minutes?",
        "What is 17% of 2,340? Show the calculation briefly.",
        "Solve for x: 3x - 7 = 2x + 11.",
        "A rectangle has a perimeter of 46 cm and one side of 9 cm. What is its area?",
        "If a shirt costs $40 after a 20% discount, what was the original price?",
        "How many different ways can 4 books be arranged on a shelf? Explain in one or two sentences.",
    ),
    "translation": (
        "Translate into French: 'The museum is closed on Mondays, but the garden stays open until sunset.'",
        "Translate into German: 'Could you please send me the invoice by the end of the week?'",
        "Translate into Spanish: 'We missed the last bus, so we walked home under the stars.'",
        "Translate into English: 'Il faut toujours garder une bouteille d'eau dans la voiture en été.'",
        "Translate into Italian: 'My grandmother grows tomatoes, basil and lemons in her small garden.'",
        "Translate into English: 'Morgen früh fahren wir mit dem Fahrrad zum See und machen ein Picknick.'",
    ),
    "extraction": (
        "From this note, list the people and the dates mentioned: 'Anna will visit on 3 May; Tom and Priya "
        "join her on the 5th. The review with Mr. Okafor moved from 12 May to 19 May.'",
        "Extract the product name, price and warranty from: 'The Aurora K2 kettle, now $34.99, boils 1.7 litres "
        "in under four minutes and comes with a two-year warranty.'",
        "What city, venue and start time does this invitation give? 'Join us at the Harbour Hall in Gdansk on "
        "Saturday; doors open at 6:30 pm and the concert starts at 7:15 pm.'",
        "Return the email addresses in this text as a JSON list: 'Write to sales@northwind.example or, for "
        "returns, to help@northwind.example; press enquiries go to media@northwind.example.'",
        "Which symptoms and which medicine does this message mention? 'Since Tuesday I've had a sore throat and "
        "a mild fever; the pharmacist suggested ibuprofen twice a day.'",
        "Pull out every number with its unit: 'The trail is 12.5 km long, climbs 640 m, and takes about 4 hours; "
        "bring at least 2 litres of water.'",
    ),
    "list": (
        "List five vegetables that grow well on a sunny balcony.",
        "Give me a packing list for a three-day hiking trip in autumn.",
        "Name six classic board games suitable for a family with young children.",
        "List the steps to change a flat tyre on a bicycle.",
        "What are four habits that help people sleep better? One line each.",
        "List five questions to ask a landlord before renting a flat.",
    ),
    "languages": (
        "한국어로 대답해 주세요: 서울에서 처음 여행하는 사람에게 추천할 만한 음식 세 가지는 무엇인가요?",
        "用中文回答：为什么秋天的树叶会变成黄色和红色？请简单解释。",
        "日本語で答えてください：雨の日に家で楽しめる過ごし方を三つ教えてください。",
        "Ответь по-русски: как лучше подготовиться к первому забегу на пять километров?",
        "أجب باللغة العربية: ما هي فوائد شرب الماء بانتظام خلال اليوم؟",
        "Responde en español: ¿qué consejos darías a alguien que quiere empezar a ahorrar dinero cada mes?",
    ),
    "sql": (
        "Write a SQL query that returns the ten customers with the highest total order value from tables "
        "customers(id, name) and orders(id, customer_id, amount).",
        "In SQL, how do I find duplicate email addresses in a table users(id, email)? Give only the query.",
        "Write a PostgreSQL query for the number of signups per week in 2024 from accounts(id, created_at).",
        "Create a SQL table for library loans: a book, a member, the loan date and the return date, with keys.",
        "Write a SQL query listing departments whose average salary exceeds 60000, from employees(id, dept, salary).",
        "Give a SQL UPDATE that raises by 5% the price of every product in category 'garden' in products(id, "
        "category, price).",
    ),
    "json": (
        "Return a JSON object describing a book with title, author, year and a list of three genres. Only JSON.",
        "Give me a JSON array of four European capitals, each an object with name, country and population.",
        "Convert to JSON with keys name, age and hobbies: 'Maya is 29 and enjoys climbing, chess and baking.'",
        "Write a JSON configuration for a web server: port 8080, two allowed origins, logging level 'info'.",
        "Produce a JSON object for a weather forecast: city Lisbon, three days, each with a date, high, low and sky.",
        "Answer only with JSON: an object mapping the weekdays Monday to Friday to a short workout for each.",
    ),
    "summary": (
        "Summarise in two sentences: 'The city council voted on Tuesday to turn the old tram depot into a public "
        "library and workshop space. Work starts next spring and should take eighteen months, funded partly by a "
        "regional grant. Residents asked for longer opening hours and a cafe, which the plans now include.'",
        "Give a one-sentence summary: 'After three dry summers, farmers in the valley switched to drip irrigation "
        "and drought-tolerant barley. Yields dipped the first year but recovered, and water use fell by a third.'",
        "Summarise the main point: 'Researchers found that people who took short walks after meals had lower "
        "blood sugar peaks than those who sat, even when the walks lasted only two to five minutes.'",
        "Summarise this review in one line: 'The hotel was spotless and the staff friendly, but the walls were "
        "thin, the breakfast repetitive, and the wifi dropped every evening.'",
        "In two bullet points, what does this say? 'Our team will move to the new office on 1 March. Desks are "
        "shared, so book one in the app; lockers are available on the second floor for personal items.'",
        "Summarise briefly: 'The museum's new exhibition pairs medieval maps with satellite images of the same "
        "coastlines, showing how rivers shifted, harbours silted up and towns moved inland over six centuries.'",
    ),
}


def short_prompts() -> list[BenchPrompt]:
    return [BenchPrompt(f"{style}-{i + 1}", style, (text,)) for style, texts in PROMPTS.items()
            for i, text in enumerate(texts)]
